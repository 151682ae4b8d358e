"""Every check module, in one list: importing this fills the registry. The package's ``__init__`` and
the pytest base class (which reads the check ids when its class is defined) both import it, so a new
check module is registered for every way in by one line here."""

from . import checks_async, checks_convergence, checks_declared, checks_freshness, checks_rows  # noqa: F401
from . import checks_semantic, checks_sequences, checks_time_major, checks_windows  # noqa: F401
