"""cutedebug.instrument"""

# The hooks that fill the fault registry: the pipeline / sync faults (fault_catalog.py) and the
# value faults (wrong-value rows of the failure table) live in their own modules and join the
# registry here, so faults.py never imports them (no cycle).
from cutedebug.instrument import fault_catalog as _fault_catalog  # noqa: E402,F401  (registers)
from cutedebug.instrument import faults as _faults  # noqa: E402
from cutedebug.instrument import value_faults as _value_faults

_value_faults.register(_faults.FAULTS)
