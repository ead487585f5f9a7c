# shellcheck shell=bash disable=SC2034,SC2154  # py, failed: the sourcing script's; out: set by it
# The harness scripts/ras-gpu.sh and scripts/ras-gpu-nodes.sh share; sourced, not run.
# ras_harness NAME PREFIX, with $out an absolute folder, makes the work folder
# (/tmp/ras-NAME.XXXXXX, replies/ in it) and the summary ($out/PREFIXsummary.txt), and on
# exit kills what the script started (its pids array, stopped ones woken first) and saves
# the ranks' logs ($out/PREFIXranks.log) and the recorded replies
# ($out/PREFIXreplies.tar.gz). note/pass/fail write the summary's lines (fail sets
# $failed, the exit status); stop_step and cont_step judge /job through the script's own
# probe function (scripts/ras_probe.py where serve listens).
hang_after=${RAS_HANG_AFTER:-20}
interval=${RAS_INTERVAL:-2}
py=${PYTHON:-python3}
failed=0
pids=()

ras_harness() {
    work=$(mktemp -d "/tmp/ras-$1.XXXXXX")
    mkdir -p "$work/replies"
    saved=$out/$2
    summary=${saved}summary.txt
    : > "$summary"
    trap ras_cleanup EXIT
}

ras_cleanup() {
    local p
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    cat "$work"/rank*.log > "${saved}ranks.log" 2>/dev/null
    tar -C "$work" -czf "${saved}replies.tar.gz" replies 2>/dev/null
    rm -rf "$work"
}

note() { echo "$*" | tee -a "$summary"; }
pass() { note "PASS $*"; }
fail() { note "FAIL $*"; failed=1; }

# stop_step STEP RANK PID PATTERN [WHERE], after `kill -STOP PID`: /job must say hung, with
# PATTERN (the rank's pid, and where it runs) in its line, within --hang-after + one
# --watch-interval + 5 s (the probe's poll), and /job/livez must answer 503. RANK is how
# the failure line names the rank ("rank 1"); WHERE follows the bound in the pass line.
stop_step() {
    local step=$1 rank=$2 pid=$3 pattern=$4 where=${5:-} line secs livez
    local bound=$((hang_after + interval + 5))
    if line=$(probe wait hung $((bound + 30))); then
        secs=${line%% *}
        livez=$(probe get /job/livez | head -1)
        if awk "BEGIN{exit !($secs <= $bound)}" && [ "$livez" = 503 ] && [[ $line == *"$pattern"* ]]; then
            pass "$step: hung named ${secs}s after SIGSTOP (bound ${bound}s)$where, /job/livez $livez: ${line#* }"
        else
            fail "$step: ${secs}s (bound ${bound}s), /job/livez $livez, $rank is pid $pid: ${line#* }"
        fi
    else
        fail "$step: $line"
    fi
}

# cont_step, after `kill -CONT`: /job healthy again within 60 s.
cont_step() {
    local line
    if line=$(probe wait healthy 60); then pass "cont: healthy ${line%% *}s after SIGCONT"; else fail "cont: $line"; fi
}
