/* interpose.h: whether a library function the executable defines is the one the process calls.
 *
 * The front replaces a few functions of the libraries under h2o by defining them in the executable
 * (read_pause.h and inline_write.h: libuv's; head_format.h: glibc's __sprintf_chk; h2_head.h:
 * libh2o's h2o_hpack_flatten_response; mem_pool.h: libh2o's h2o_mem_alloc_pool and
 * h2o_mem_clear_pool; h2c_upgrade.h: libh2o's h2o_http2_handle_upgrade). A library's call of such a function goes through its PLT,
 * which the dynamic linker binds to the executable's definition when the executable exports it. */
#ifndef AGW_FRONT_INTERPOSE_H
#define AGW_FRONT_INTERPOSE_H

/* 1 when the process's calls of the function name reach ours, the function at ours: the executable
 * exports it, so dlsym(RTLD_DEFAULT) finds it first; 0 otherwise. Each file's check at start uses it
 * (agw_read_pause_active, agw_inline_write_active, agw_head_format_active, agw_h2_head_active,
 * agw_mem_pool_active, agw_h2c_upgrade_declined).
 * Thread-safe. */
int agw_interposed(const char *name, void *ours);

#endif
