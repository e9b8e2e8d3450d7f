#!/usr/bin/env bash
# One device session: the whole stack on a GPU host. Dev server + worker (--role all), a search run per
# problem started with `marathon start`, their reports, the scoreboard with each run's best kernel, and the
# orchestration-overhead benchmark on this host's CPUs. Everything lands under $OUT (default ./gpu-out).
#   scripts/gpu_session.sh "kda mla_decode" 0.05      # problems, hours per run
set -uo pipefail
PROBLEMS=${1:-"kda mla_decode"}
HOURS=${2:-0.05}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MARATHON_HOME=/tmp/marathon-home MARATHON_ARTIFACTS=/tmp/marathon-artifacts
M="python -m workflows.cli"
log() { echo "[$(date +%H:%M:%S)] $*"; }

$M dev --headless --db /tmp/marathon-home/temporal.db > "$OUT/dev.log" 2>&1 &
DEV=$!
for i in $(seq 1 100); do $M status nosuch >/dev/null 2>&1; [ $? -ne 2 ] && break; \
  python - <<'P' && break
import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(("127.0.0.1",7233))==0 else 1)
P
  sleep 0.3; done
$M worker --role all > "$OUT/worker.log" 2>&1 &
WORKER=$!
log "dev server $DEV, worker $WORKER"
for p in $PROBLEMS; do
  $M start "$p" --iterations 200 --hours "$HOURS" --id "h200-$p" || log "start $p failed"
done
for p in $PROBLEMS; do
  $M watch "h200-$p" > "$OUT/watch-$p.txt" 2>&1
  $M status "h200-$p" --json > "$OUT/status-$p.json" 2>&1
  $M report "h200-$p" --out "$OUT/report-$p" > /dev/null 2>&1 || log "report $p failed"
  tail -3 "$OUT/watch-$p.txt"
done
BEST=()
for p in $PROBLEMS; do
  key=$(python - "$OUT/status-$p.json" "$p" <<'P'
import json,sys
from activities.ledger import read_ledger
from activities.artifacts import ArtifactStore
st=json.load(open(sys.argv[1])); b=st.get("best")
recs=read_ledger(ArtifactStore(), st.get("ledger_key"))
print(next((r.source_key for r in recs if b and r.candidate_id==b["candidate_id"]), ""))
P
)
  [ -n "$key" ] && BEST+=(--best "$p=$key")
done
kill $WORKER; wait $WORKER 2>/dev/null
log "scoreboard ${BEST[*]:-}"
timeout ${BENCH_TIMEOUT:-200} python -m gpu_worker.scoreboard $PROBLEMS mla_prefill --primary-only --out "$OUT" "${BEST[@]}" \
  > "$OUT/scoreboard.log" 2>&1 || log "scoreboard exited $?"
tail -5 "$OUT/scoreboard.log"
timeout ${OVERHEAD_TIMEOUT:-120} python -m tests.bench_overhead --out "$OUT/orchestration-overhead.md" > "$OUT/overhead.log" 2>&1 \
  || log "overhead bench exited $?"
grep -A3 "| loop" "$OUT/orchestration-overhead.md"
kill $DEV 2>/dev/null
log done
