"""
ASGI config for evalsite project.

It exposes the ASGI callable as a module-level variable named ``application``.

For more information on this file, see
https://docs.djangoproject.com/en/5.2/howto/deployment/asgi/
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
# The web server under ASGI serves many requests (and live streams) from short-lived threads:
# on PostgreSQL it takes its connections from a bounded pool (settings.DATABASE_POOL_MAX_SIZE).
os.environ.setdefault("EVALSITE_ASGI", "1")

from django.conf import settings  # noqa: E402  (after the environment above)

from evalsite.overload import Admission  # noqa: E402

# At most WEB_MAX_IN_FLIGHT requests at once; the others wait their turn, then get 503 (overload.py).
application = Admission(get_asgi_application(), settings.WEB_MAX_IN_FLIGHT, settings.WEB_QUEUE_SECONDS)
