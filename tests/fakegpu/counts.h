/* What a test program running under tests/fakegpu (LD_PRELOADed) may ask
 * the fake: fakegpu_counts (fakegpu.c), found with dlsym so that the
 * program runs without the fake too. */
#ifndef NRS_FAKEGPU_COUNTS_H
#define NRS_FAKEGPU_COUNTS_H

#include <dlfcn.h>

/* The communicators this process made so far (init, split, shrink) and the
 * copies it asked for (cudaMemcpy*, any kind): 0, or -1 without the fake. */
static inline int fakegpu_counts_get(long *comms, long *copies)
{
    void (*f)(long *, long *);
    *(void **)&f = dlsym(RTLD_DEFAULT, "fakegpu_counts");
    if (!f)
        return -1;
    f(comms, copies);
    return 0;
}

#endif
