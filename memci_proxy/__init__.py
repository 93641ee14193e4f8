"""Memci proxy.

platformdirs warns (``RuntimeDirWarning``) on every process where ``XDG_RUNTIME_DIR`` is unset (containers, cron,
ssh without a login session) when the embedded PostgreSQL asks it for a runtime directory, and then uses a fallback
under /tmp that works. The warning says nothing a user can act on, so no command of the proxy shows it.
"""

import warnings

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
