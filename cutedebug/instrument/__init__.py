"""cutedebug.instrument"""

# The one hook for the value faults (wrong-value rows of the failure table): they live in their
# own module and join the registry here, so faults.py never imports them (no cycle).
from cutedebug.instrument import faults as _faults  # noqa: E402
from cutedebug.instrument import value_faults as _value_faults

_value_faults.register(_faults.FAULTS)
