"""HTTP: the ASGI app and its server, the endpoint table, request reading, the access
log, the OpenAPI document and each operation's documentation, the console; the
handlers in `handlers/`. Nothing here imports a database or Redis driver."""
