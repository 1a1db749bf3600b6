"""Problems built from the library's layers."""
