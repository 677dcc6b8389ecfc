"""Settings every test shares. Kept minimal: fixtures live with their tests."""

import os

# The CPU reference plugin hands out device pointers in a PROT_NONE range, so any
# host dereference of one faults. Set before any plugin is loaded (loading is lazy).
os.environ["OAR_REFCPU_STRICT"] = "1"
