"""The store's schema: NNNN_name.sql, applied in number order when a store opens (postgres/: the same
for PostgreSQL)."""
