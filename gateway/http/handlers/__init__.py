"""The endpoint handlers, one module per resource: each parses its request with
`gateway.api`, calls the claim path, the store or the credentials through the
`Gateway`, and shapes the answer. No handler imports asyncpg or redis."""
