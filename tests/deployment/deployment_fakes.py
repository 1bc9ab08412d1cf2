"""What the deployment test puts in place of keystone, glance and neutron.

* :class:`NoAuth`: a paste filter in front of nova's ``keystonecontext``, the
  ``noauth2`` strategy nova 34 no longer ships: ``X-Auth-Token: user:project``
  becomes the ``X-User-Id``/``X-Project-Id``/``X-Roles`` headers nova's
  context is made from (``admin`` as user: the admin, member and reader roles).
* :func:`application`: a WSGI application answering the few calls nova makes
  to glance (one image, its schema) and to neutron (every list empty: servers
  boot with ``networks = none``, their deletion still lists their ports).

``python deployment_fakes.py PORT`` serves :func:`application` on 127.0.0.1.
"""

from __future__ import annotations

import json
import socketserver
import sys
from typing import Any
from wsgiref import simple_server

#: what every image here has (glance's v2 fields)
_IMAGE_FIELDS = {
    "status": "active", "visibility": "public",
    "protected": False, "os_hidden": False, "disk_format": "raw", "container_format": "bare",
    "size": 1048576, "virtual_size": 1048576, "min_ram": 0, "min_disk": 0, "checksum": None,
    "owner": "admin", "tags": [], "created_at": "2025-01-01T00:00:00Z",
    "updated_at": "2025-01-01T00:00:00Z", "schema": "/v2/schemas/image",
}


def _image(image_id: str, name: str, **properties: str) -> dict[str, Any]:
    return {"id": image_id, "name": name, **_IMAGE_FIELDS, "file": f"/v2/images/{image_id}/file",
            "self": f"/v2/images/{image_id}", **properties}


#: every server boots with it
IMAGE_ID = "2a6f1e9c-5f5d-4d49-9c43-6f1b3b2d0c01"
IMAGE = _image(IMAGE_ID, "cirros")
#: the rebuild check's: one the fake computes run (x86_64), one they cannot (aarch64:
#: nova's ImagePropertiesFilter refuses every compute for it)
REBUILD_IMAGE_ID = "2a6f1e9c-5f5d-4d49-9c43-6f1b3b2d0c02"
FOREIGN_IMAGE_ID = "2a6f1e9c-5f5d-4d49-9c43-6f1b3b2d0c03"
IMAGES = {i["id"]: i for i in (IMAGE, _image(REBUILD_IMAGE_ID, "cirros-new"),
                               _image(FOREIGN_IMAGE_ID, "cirros-arm", hw_architecture="aarch64"))}
# glanceclient builds its image model from this; nova takes the properties named here as
# the image's own fields, any other as an image property
IMAGE_SCHEMA = {"name": "image", "properties": {name: {} for name in IMAGE},
                "additionalProperties": {"type": "string"}, "links": []}

_ROLE_HEADERS = ("HTTP_X_USER_ID", "HTTP_X_USER", "HTTP_X_PROJECT_ID", "HTTP_X_TENANT_ID",
                 "HTTP_X_TENANT", "HTTP_X_ROLES", "HTTP_X_ROLE", "HTTP_X_IDENTITY_STATUS")


class NoAuth:
    """``X-Auth-Token: user:project`` as the identity of the request (no token is checked)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    @classmethod
    def factory(cls, global_conf: Any, **local_conf: Any) -> Any:
        return cls

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        token = environ.get("HTTP_X_AUTH_TOKEN", "")
        if not token:
            start_response("401 Unauthorized", [("Content-Type", "application/json")])
            return [b'{"error": "X-Auth-Token: user:project is required"}']
        for name in _ROLE_HEADERS:
            environ.pop(name, None)
        user, _, project = token.partition(":")
        roles = "admin,member,reader" if user == "admin" else "member,reader"
        environ.update({"HTTP_X_USER_ID": user, "HTTP_X_PROJECT_ID": project or user,
                        "HTTP_X_ROLES": roles, "HTTP_X_IDENTITY_STATUS": "Confirmed"})
        return self.app(environ, start_response)


def _json(start_response: Any, status: str, body: Any) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
    return [data]


def application(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    path = environ.get("PATH_INFO", "/").rstrip("/")
    if path.endswith(".json"):
        path = path[:-5]
    method = environ.get("REQUEST_METHOD", "GET")
    # glance
    if path == "/v2/schemas/image":
        return _json(start_response, "200 OK", IMAGE_SCHEMA)
    if path == "/v2/images":
        return _json(start_response, "200 OK", {"images": list(IMAGES.values()),
                                                "schema": "/v2/schemas/images"})
    if path.startswith("/v2/images/"):
        image = IMAGES.get(path.split("/")[3])
        if image is not None:
            return _json(start_response, "200 OK", image)
        return _json(start_response, "404 Not Found", {"message": "no such image"})
    # neutron: every collection is empty, nothing else exists
    if path.startswith("/v2.0/"):
        parts = path.split("/")
        if method == "GET" and len(parts) == 3:
            return _json(start_response, "200 OK", {parts[2].replace("-", "_"): []})
        return _json(start_response, "404 Not Found",
                     {"NeutronError": {"type": "NotFound", "message": path, "detail": ""}})
    if path in ("", "/v2.0"):
        return _json(start_response, "200 OK", {"versions": []})
    return _json(start_response, "404 Not Found", {"message": path})


class _Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class _Quiet(simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        sys.stderr.write("%s\n" % (format % args))


def main(argv: list[str]) -> None:
    server = simple_server.make_server("127.0.0.1", int(argv[1]), application,
                                       server_class=_Server, handler_class=_Quiet)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
