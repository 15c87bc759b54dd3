"""Test-wide settings.

Under CI (``CI`` set) hypothesis draws the same examples every run, so a red CI can be
reproduced exactly; locally it keeps exploring new ones.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
