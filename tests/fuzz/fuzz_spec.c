/* libFuzzer target: the job-spec loader must return 0 or -1 with one
 * well-formed error line, whatever the bytes; ASan/UBSan catch the rest. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nereus/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[NRS_ERR_MAX];
    nrs_spec_t spec;
    int rc = nrs_spec_load_buffer("fuzz", (const char *)data, size, &spec, err, sizeof(err));
    if (rc != 0 && rc != -1)
        abort();
    if (rc == -1 && (strncmp(err, "fuzz:", 5) != 0 || strchr(err, '\n')))
        abort();
    if (rc == 0 && (!spec.models[NRS_ROLE_ACTOR].present || spec.cluster.nodes < 1))
        abort();
    return 0;
}
