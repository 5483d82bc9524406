/* The heat-mpi 5-point update in one pass: out = c + rx (n + s - 2c) + ry (w + e - 2c).
 *
 * The operations and their order are those of the numpy strips in heat.py, so the two give
 * bit-identical fields: build with -ffp-contract=off (no fused multiply-add) and without
 * -ffast-math. u and out are row-major with one ghost layer: (rows + 2) x (cols + 2), row
 * strides given in elements. Loaded with ctypes; built by `make kernels` (and the images).
 */
#include <stddef.h>

void heat_step(const double *restrict u, double *restrict out, long rows, long cols, long su, long so,
               double rx, double ry)
{
    for (long i = 1; i <= rows; i++) {
        const double *up = u + (i - 1) * su, *mid = u + i * su, *dn = u + (i + 1) * su;
        double *o = out + i * so;
        for (long j = 1; j <= cols; j++) {
            double c = mid[j];
            double two_c = c * 2.0;
            double tx = (up[j] + dn[j]) - two_c;
            double ty = (mid[j - 1] + mid[j + 1]) - two_c;
            tx = tx * rx;
            ty = ty * ry;
            o[j] = (c + tx) + ty;
        }
    }
}
