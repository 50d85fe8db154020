"""The wire format, with no web framework and no I/O: request fields and bodies declared
once, the parsers that turn a body into a request object, the task's JSON form, exact
JSON numbers, sealed cursors and the answers' JSON Schemas."""
