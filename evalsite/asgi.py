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

application = get_asgi_application()
