# Shared by the bench scripts (sourced): waiting for a process to end.

# Waits up to $2 tenths of a second for PID $1 to exit; 0 when it did.
wait_gone() {
    local pid=$1 tenths=$2
    while ((tenths-- > 0)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    ! kill -0 "$pid" 2>/dev/null
}
