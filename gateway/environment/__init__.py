"""Every environment variable the gateway reads, each declared once.

A declaration (Variable, gateway/variable.py) holds the variable's name, the Settings
field it sets, how its text is read (kind, default, bounds or choices, unit) and one
paragraph on what it means. `Settings.from_env` reads the environment through these
declarations alone, and the configuration reference of the documentation is written
from them, so a variable cannot be read without being documented. They are declared by
concern, a module each: the service, Postgres, Redis, maintenance.
"""

from __future__ import annotations

from ..variable import Variable
from . import database, maintenance, redis, service
from .bounds import DEFAULT_REDIS_MAX_CONNECTIONS as DEFAULT_REDIS_MAX_CONNECTIONS
from .bounds import LOG_FORMATS as LOG_FORMATS
from .bounds import MAX_JSON_DEPTH_LIMIT as MAX_JSON_DEPTH_LIMIT
from .bounds import MAX_REDIS_MAX_CONNECTIONS as MAX_REDIS_MAX_CONNECTIONS
from .bounds import MIN_ADMIN_TOKEN_CHARS as MIN_ADMIN_TOKEN_CHARS
from .bounds import REDIS_MODES as REDIS_MODES
from .bounds import SWITCH as SWITCH

# The variables by concern, as the configuration reference groups them: (title, the
# declarations).
GROUPS: tuple[tuple[str, tuple[Variable, ...]], ...] = (
    (service.TITLE, service.SERVICE),
    (database.TITLE, database.DATABASE),
    (redis.TITLE, redis.REDIS),
    (maintenance.TITLE, maintenance.MAINTENANCE),
)
# Every environment variable `Settings.from_env` reads, and no other: it refuses to read
# a name missing here, so deployment checks can trust ENV_NAMES, and the configuration
# reference (docs/hooks) is written from these declarations; a doc's links are paths from
# the documentation's root, docs/.
VARIABLES: tuple[Variable, ...] = tuple(v for _, group in GROUPS for v in group)
ENV_NAMES = frozenset(variable.name for variable in VARIABLES)
