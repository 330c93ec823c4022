"""Django's PostgreSQL backend, with evalsite's pool (`pool.Pool`): an outage is said at once and
its end noticed within a second."""

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base

from evalsite.postgresql.pool import Pool


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not options:
            return None
        if self.alias not in self._connection_pools:
            # As Django builds its pool (django/db/backends/postgresql/base.py), with ours.
            kwargs = {**self.get_connection_params(), "autocommit": True}
            pool = Pool(
                kwargs=kwargs,
                open=False,
                configure=self._configure_connection,
                check=Pool.check_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if options is True else options),
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
