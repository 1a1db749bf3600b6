"""The application: the ``jaxsem`` command line, benchmark and verification drivers, reports."""
