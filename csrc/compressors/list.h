// Every compressor, one line each: CGX_COMPRESSOR(name, id). `name` is the registry name and the
// suffix of the factory `make_<name>` / spec list `specs_<name>` defined in <name>.cc (or a file
// it shares); `id` is the stable byte that payload headers carry (never reuse one).
// Registering a compressor here is all it takes for the Python API, the backend and the generic
// tests to pick it up (docs/adding-a-compressor.md).
CGX_COMPRESSOR(maxmin, 0)
CGX_COMPRESSOR(fp16, 1)
CGX_COMPRESSOR(bf16, 2)
CGX_COMPRESSOR(signsgd, 3)
CGX_COMPRESSOR(signum, 4)
#include "list_quant.h"
#include "list_sparse.h"
