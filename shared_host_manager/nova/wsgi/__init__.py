"""WSGI applications of nova's API services with the shared host state (uWSGI ``module =``)."""
