"""nova's compute API with the API-side source: point uWSGI at this module instead of nova's.

::

    [uwsgi]
    module = shared_host_manager.nova.wsgi.osapi_compute:application

It is ``nova.wsgi.osapi_compute``'s application (nova's configuration, paste
pipeline and services as nova builds them), and every change it makes to a
compute service, a compute node or an aggregate is published on the host-state
stream before the API call returns (shared_host_manager.nova.api_publisher).
The publisher starts in each worker, after uWSGI forked it.
"""

# nova's first line, first: its imports must see the threading backend chosen
from nova import monkey_patch; monkey_patch.patch(backend="threading")  # noqa: E702, I001

from shared_host_manager.nova import cmd  # noqa: E402

application = cmd.api_wsgi_application()
