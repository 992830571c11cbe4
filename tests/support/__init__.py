"""Helpers the test groups share: a live admin server, trace generation, loaded modules, paths."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (where pyproject.toml is)."""
