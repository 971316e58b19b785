/* interpose.c: whether a library function the executable defines is the one the process calls
 * (interpose.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT */
#endif
#include "front/interpose.h"

#include <dlfcn.h>

int agw_interposed(const char *name, void *ours)
{
    return dlsym(RTLD_DEFAULT, name) == ours;
}
