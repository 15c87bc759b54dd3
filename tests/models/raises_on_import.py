"""Test model: importing it fails, as when a dependency or a weights file is missing."""

raise RuntimeError("weights file ckpt.pt not found")
