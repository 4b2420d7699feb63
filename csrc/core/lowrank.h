// PowerSGD's passes over a gradient matrix, fused so that each reads the matrix once
// (torch_cgx/hooks/lowrank.py). Matrices are row-major and contiguous; Q is given transposed
// (qt: rank x cols) so that every inner loop runs along a row. fp32 only.
#pragma once

#include <cstdint>

namespace cgx::lowrank {

// m += e (e may be null: no error feedback), then p = m q: p (rows x rank) receives the
// product of the updated matrix with Q. One pass over m (and e).
void add_and_project(float* m, const float* e, const float* qt, float* p, int64_t rows,
                     int64_t cols, int rank);

// qt = (m^T p)^T = p^T m (rank x cols): Q's product, accumulated along the rows in fp32 over
// blocks of rows and in fp64 across blocks. One pass over m.
void transpose_project(const float* m, const float* p, float* qt, int64_t rows, int64_t cols,
                       int rank);

// With a = p qt (p: rows x rank): err = m - a (err may be null), then m = a. One pass over m.
void decompress(float* m, float* err, const float* p, const float* qt, int64_t rows, int64_t cols,
                int rank);

}  // namespace cgx::lowrank
