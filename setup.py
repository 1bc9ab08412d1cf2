"""shared-host-manager: a versioned, claim-arbitrated host-state cache for cloud schedulers."""

from setuptools import find_packages, setup

setup(
    name="shared-host-manager",
    version="0.1.0",
    description=(
        "Scheduler host state without a database read: versioned deltas from "
        "every compute node, claims arbitrated by the compute node."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=[
        "protocol", "protocol.*",
        "transport", "transport.*",
        "compute_reporter", "compute_reporter.*",
        "shared_host_manager", "shared_host_manager.*",
        "simulator", "simulator.*",
    ]),
    install_requires=[
        "msgpack>=1.0",
        "kombu>=5.3",
        "oslo.messaging>=14.0",
        "oslo.config>=9.0",
        "oslo.log>=5.0",
        "stevedore>=5.0",
        "numpy>=1.26",
        "SQLAlchemy>=2.0",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2",
            "hypothesis>=6.100",
            "ruff>=0.5",
        ],
        "eventlet": ["eventlet>=0.36"],
    },
    entry_points={
        "console_scripts": [
            "shm = shared_host_manager.cmd.shm:main",
        ],
    },
)
