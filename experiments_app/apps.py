from django.apps import AppConfig


class ExperimentsAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "experiments_app"
