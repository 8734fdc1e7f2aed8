"""Drop-in integrations of the FreshPER buffer into other trainers (each needs its own extra)."""
