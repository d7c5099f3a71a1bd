#!/bin/sh
# libinfill_client exports only infill_* functions (the linker version script).
set -eu
lib="$1"
symbols=$(nm -D --defined-only "$lib" | awk '{print $3}')
[ -n "$symbols" ] || { echo "no exported symbols in $lib"; exit 1; }
bad=$(printf '%s\n' "$symbols" | grep -v '^infill_' || true)
if [ -n "$bad" ]; then
  echo "symbols outside the infill_ prefix exported by $lib:"
  printf '%s\n' "$bad"
  exit 1
fi
for needed in infill_api_version infill_client_create infill_client_submit_edit infill_error_delete infill_job_wait \
    infill_client_upload_adapter_file infill_client_list_adapters infill_client_delete_adapter infill_edit_adapter_init; do
  printf '%s\n' "$symbols" | grep -qx "$needed" || { echo "$needed is not exported"; exit 1; }
done
echo "$(printf '%s\n' "$symbols" | wc -l) symbols, all infill_*"
