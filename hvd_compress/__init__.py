"""hvd_compress."""
