"""Who may call the gateway, and with what: principals and scopes (principals.py), the
scoped API tokens and webhook signing secrets with their rows (credentials.py), and the
verifier of signed webhook deliveries (webhooks.py)."""
