"""sync_plugin."""
