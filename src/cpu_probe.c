/* setup.py's question before an editable install compiles the kernels for this CPU only:
 * which of the features named on the command line does this machine have? One line per
 * name: 1, 0, or -1 for a name cpu_features.h does not know. The same probe as the
 * dispatcher's (lite_llm._kernels._cpu.has), without building a Python module first. */
#include <stdio.h>
#include "cpu_features.h"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) printf("%d\n", ll_cpu_has(argv[i]));
    return 0;
}
