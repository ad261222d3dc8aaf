"""A recipe's bill before anything loads: passes, memory, time, and where models would sit."""
