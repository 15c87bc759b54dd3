"""pipeplan: plan, simulate and run pipeline-parallel training of PyTorch models.

The public API (see docs/api.md)::

    import planner
    profile = planner.load_profile("profiles/gpt.json")
"""

from planner.errors import InfeasibleError, InputError
from planner.profile import Profile, load_profile

__all__ = ["InfeasibleError", "InputError", "Profile", "load_profile"]
__version__ = "0.1.0"
