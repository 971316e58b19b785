/* LD_PRELOAD shim for tests/integration/test_io_uring.py: every io_uring the process creates can
 * run IORING_OP_NOP only, as a kernel that has io_uring but not IORING_OP_SEND/IORING_OP_RECV
 * (Linux 5.1-5.5: -EINVAL) or a sandbox that filters io_uring operations. The ring is set up
 * with IORING_SETUP_R_DISABLED, restricted to NOP (IORING_REGISTER_RESTRICTIONS, Linux >= 5.10),
 * then enabled: io_uring_queue_init succeeds, and every send or recv on it completes with an
 * error (-EACCES) instead of running. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <liburing.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
    int (*real)(unsigned, struct io_uring *, unsigned) =
        (int (*)(unsigned, struct io_uring *, unsigned))dlsym(RTLD_NEXT, "io_uring_queue_init");
    int e = real(entries, ring, flags | IORING_SETUP_R_DISABLED);
    if (e < 0)
        return e;
    struct io_uring_restriction r;
    memset(&r, 0, sizeof(r));
    r.opcode = IORING_RESTRICTION_SQE_OP;
    r.sqe_op = IORING_OP_NOP;
    if (syscall(__NR_io_uring_register, ring->ring_fd, IORING_REGISTER_RESTRICTIONS, &r, 1) < 0 ||
        syscall(__NR_io_uring_register, ring->ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0) < 0) {
        io_uring_queue_exit(ring);
        return -1;
    }
    return 0;
}
