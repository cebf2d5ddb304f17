"""`vmsched security`: the identities vmsched's parts run as, and what each may do on RabbitMQ,
Redis and PostgreSQL, as definitions to print or apply."""
