#!/bin/sh
# Runs in the temporalio/admin-tools image before the server starts: creates the two PostgreSQL
# databases Temporal uses (persistence and visibility) and brings their schemas to the version that
# ships in the image. Safe to run again on an existing volume: `create` and `setup-schema` only act
# the first time, `update-schema` applies whatever versions are missing.
set -eu
: "${POSTGRES_SEEDS:?}" "${POSTGRES_USER:?}" "${SQL_PASSWORD:?}"
DB_PORT="${DB_PORT:-5432}"
SCHEMA=/etc/temporal/schema/postgresql/v12

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$DB_PORT" -u "$POSTGRES_USER" "$@"
}

for db in "${TEMPORAL_DB:-temporal}:temporal" "${VISIBILITY_DB:-temporal_visibility}:visibility"; do
  name="${db%%:*}"
  kind="${db##*:}"
  echo "schema: database $name ($kind)"
  sql --db "$name" create 2>/dev/null || echo "schema: $name exists"
  if ! sql --db "$name" setup-schema -v 0.0 2>/dev/null; then
    echo "schema: $name already has a schema_version table"
  fi
  sql --db "$name" update-schema -d "$SCHEMA/$kind/versioned"
done
echo "schema: done"
