"""PostgreSQL: connections, schema migrations, the built-in catalogue and the policy repository.

await migrate(settings.postgres_url)        # once at start-up; safe to run concurrently
pool = await connect(settings.postgres_url)
repo = PolicyRepository(pool)
policy = await repo.get_for_cluster("cluster-1")

pool.py holds the connections, policy_rows.py reads and writes policies as rows, catalogue.py writes
the registry's units and the built-in policies, repository.py is the API the services and the admin
commands use. Nothing here knows the bus or the runtime: the per-process policy cache that follows
policy.changed events is vmsched.policy_cache.
"""

from vmsched.db.catalogue import seed_builtins
from vmsched.db.migrate import MIGRATION_LOCK_KEY, MigrationError, ensure_database, load_migrations, migrate
from vmsched.db.policy_rows import unit_id
from vmsched.db.pool import connect
from vmsched.db.repository import ClusterSettings, PolicyRepository
from vmsched.errors import PolicyError, PolicyExists, PolicyInUse, PolicyLocked, PolicyNotFound

__all__ = [
    "MIGRATION_LOCK_KEY",
    "ClusterSettings",
    "MigrationError",
    "PolicyError",
    "PolicyExists",
    "PolicyInUse",
    "PolicyLocked",
    "PolicyNotFound",
    "PolicyRepository",
    "connect",
    "ensure_database",
    "load_migrations",
    "migrate",
    "seed_builtins",
    "unit_id",
]
