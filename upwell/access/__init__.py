"""Access: who may see and act on what, project by project."""
