"""The Textual dashboard (not built yet; see the dashboard issue)."""
