"""shared-host-manager: a versioned, claim-arbitrated host-state cache for cloud schedulers."""

from setuptools import find_packages, setup

SIM = [
    # the legacy and caching baselines read their hosts through SQLAlchemy
    "SQLAlchemy>=2.0",
    # --db-url for MariaDB / PostgreSQL in the legacy baseline
    "PyMySQL>=1.1",
    "psycopg2-binary>=2.9",
    # --plot
    "matplotlib>=3.7",
    # every engine decides with nova 34's own filter and weigher classes
    # ([filter_scheduler] decision_core = nova)
    "nova>=34.0.0,<35",
]

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
        "shm_cli", "shm_cli.*",
    ]),
    install_requires=[
        "msgpack>=1.0",
        "kombu>=5.3",
        "oslo.messaging>=14.0",
        "oslo.config>=9.0",
        "oslo.log>=5.0",
        "stevedore>=5.0",
        "numpy>=1.26",
        # threading backend of oslo.service (nova 34 runs native threads)
        "oslo.service[threading]>=4.0",
        # /metrics of every long-running process
        "prometheus_client>=0.20",
        # `shm status`: several processes side by side
        "rich>=13.0",
    ],
    extras_require={
        # what only `shm sim` and the benchmarks need
        "sim": SIM,
        "test": [
            *SIM,
            "pytest>=8",
            "pytest-timeout>=2",
            "hypothesis>=6.100",
            "ruff>=0.5",
            "mypy>=2.4",
            # the drop-in's tests run nova's own filters and SchedulerManager
            "nova>=34.0.0,<35",
            # tests/nova_functional runs nova 34's own functional tests (what they import);
            # SQLAlchemy 2.1's deprecation warnings turn into API errors under nova's fixtures
            "SQLAlchemy>=2.0,<2.1",
            "openstack-placement",
            "oslotest",
            "testtools",
            "fixtures",
            "testscenarios",
            "testresources",
            "requests-mock",
            "ddt",
            "wsgi-intercept",
            # installed in many nova deployments: nova's database layer then reads [profiler]
            "osprofiler",
            # tests/deployment: nova-api and placement under uWSGI (built from source), driven
            # through openstacksdk
            "uwsgi>=2.0",
            "openstacksdk>=4.0",
        ],
        "nova": ["nova>=34.0.0,<35"],
        # shm sim --scheduler nova: nova's scheduler with placement in-process and nova's DB
        "nova-sim": [*SIM, "nova>=34.0.0,<35", "SQLAlchemy>=2.0,<2.1", "openstack-placement",
                     "wsgi-intercept"],
        "eventlet": ["eventlet>=0.36"],
        # tests/deployment: nova and placement as processes, nova-api and placement under uWSGI
        # (built from source: needs a C compiler), on MariaDB
        "deploy": ["nova>=34.0.0,<35", "SQLAlchemy>=2.0,<2.1", "openstack-placement", "PyMySQL>=1.1",
                   "uwsgi>=2.0", "openstacksdk>=4.0", "pytest>=8", "pytest-timeout>=2"],
        # shm fuzz: coverage-guided fuzzing of every door for untrusted bytes
        "fuzz": ["atheris>=2.3"],
    },
    entry_points={
        "console_scripts": [
            "shm = shm_cli.main:main",
            # nova 34 with the shared host manager (pip install shared-host-manager[nova])
            "nova-scheduler-shared = shared_host_manager.nova.cmd:main",
            "nova-compute-shared = shared_host_manager.nova.cmd:compute_main",
            "nova-conductor-shared = shared_host_manager.nova.cmd:conductor_main",
        ],
        "oslo.config.opts": [
            "shm.common = shm_cli.common:list_opts",
            "shm.transport = transport.opts:list_opts",
            "shm.metrics = transport.metrics:list_opts",
            "shm.reporter = compute_reporter.conf:list_opts",
            "shm.scheduler = shared_host_manager.conf.opts:list_scheduler_opts",
            "shm.updatelog = shared_host_manager.conf.updatelog:list_opts",
            "shm.placement_feed = shared_host_manager.conf.placement_feed:list_opts",
            "shm.nova = shared_host_manager.nova.conf:list_opts",
        ],
        # whose classes an engine loads ([filter_scheduler] decision_core)
        "shm.scheduler.cores": [
            "nova = shared_host_manager.nova.core.plugins:load_core",
        ],
        # the filters nova has no class for, by name (see shared_host_manager.decision.plugins);
        # every other name is nova's own class
        "shm.scheduler.filters": [
            "ResourceFitFilter = shared_host_manager.decision.filters.resource_fit_filter:ResourceFitFilter",
            "AvailabilityZoneFilter = shared_host_manager.decision.filters.availability_zone_filter:AvailabilityZoneFilter",
            "VolumeLocalityFilter = shared_host_manager.decision.filters.volume_locality_filter:VolumeLocalityFilter",
        ],
    },
)
