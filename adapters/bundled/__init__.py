"""The bundled adapter: the contract over radixtop's own engine (``adapter``), and what the leak
doctor reads of it (``doctor``)."""

from radixtop.adapters.bundled.adapter import BundledAdapter

__all__ = ["BundledAdapter"]
