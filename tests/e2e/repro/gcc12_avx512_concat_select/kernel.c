#include <stdio.h>
#include <stdint.h>
__attribute__((noinline)) void k(const int64_t* restrict x0, int64_t* restrict cc, int64_t* restrict ab, const int64_t* restrict x1, int64_t* restrict re) {
  for (long i1 = 0; i1 < 4; ++i1) {
    for (long i2 = 0; i2 < 10; ++i2) {
      int64_t s;
      if (i1 < 2) { s = x0[i1 * 10 + i2]; } else { s = x0[(i1 - 2) * 10 + i2]; }
#ifdef CC
      cc[i1 * 10 + i2] = s;
#endif
      ab[i1 * 10 + i2] = (s < 0 ? -s : s);
#ifdef RE
      const int64_t t8 = x1[0] + s; const int64_t t9 = t8 * t8;
      const int64_t t10 = (INT64_C(-32) > t9 ? INT64_C(-32) : t9);
      const int64_t t11 = (INT64_C(32) < t10 ? INT64_C(32) : t10);
      const int64_t t12 = -t11; re[i1 * 10 + i2] = (t12 < 0 ? 0 : t12);
#endif
    }
  }
}
int main(){ int64_t x0[20], x1[1]={5}, cc[40], ab[40], re[40]; for(int i=0;i<20;i++) x0[i]=i-7;
 k(x0,cc,ab,x1,re); for(int i=18;i<24;i++) printf("%lld ",(long long)ab[i]); printf("\n"); }
