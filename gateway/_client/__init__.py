"""The client (clients/python/gateway_client) under the server's own name, for the
`gateway` command's `work`, `enqueue` and `runtime`: the server's wheel ships the
client's source here, in place of this file (pyproject.toml, force-include), so that
the server and the client distribution never own the same file.

In a checkout, and so in its editable install, this file stands in for that copy: it
reads the same source from clients/python/gateway_client, which imports only its own
modules (relatively), and so loads here as gateway._client.
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "clients" / "python" / "gateway_client")]
_INIT = Path(__path__[0]) / "__init__.py"
exec(compile(_INIT.read_text(encoding="utf-8"), str(_INIT), "exec"))
