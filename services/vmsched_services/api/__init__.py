"""api: the HTTP API (OpenAPI 3.1) and the web console, over the bus like every other service.

It holds no state: every answer comes from the services over the bus (policy-admin, the state
tracker, the selector), so it scales like them. The JSON API lives under /api/v1, the console under
/console (vmsched_services.api.console).
"""
