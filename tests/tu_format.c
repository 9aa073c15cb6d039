/*
 * tu_format.c - helpers shared by the suites of format/ (tu_format.h):
 * the pseudo-random stream and the data drawn from it, the clock, the
 * runner. They were the static helpers and main() of test_format.c before
 * it was split in three; only the tf_ prefix is new.
 */
#include "tu_format.h"

#include <math.h>
#include <string.h>
#include <time.h>

uint64_t tf_rng_state = 0x9e3779b97f4a7c15ull;

uint64_t tf_rnd(void)
{
	/* splitmix64: fixed seed, reproducible */
	uint64_t z = (tf_rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void tf_fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(tf_rnd() >> 56);
}

uint16_t tf_f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
	return (uint16_t)(u >> 16);
}

void tf_fill_bf16_normal(uint8_t *p, size_t n_elems, double sigma)
{
	for (size_t i = 0; i < n_elems; i += 2) {
		double u1 = ((tf_rnd() >> 11) + 1) * (1.0 / 9007199254740992.0);
		double u2 = (tf_rnd() >> 11) * (1.0 / 9007199254740992.0);
		double r = sqrt(-2.0 * log(u1)) * sigma;
		uint16_t a = tf_f32_to_bf16((float)(r * cos(2 * M_PI * u2)));
		uint16_t b = tf_f32_to_bf16((float)(r * sin(2 * M_PI * u2)));

		p[2 * i] = (uint8_t)a;
		p[2 * i + 1] = (uint8_t)(a >> 8);
		if (i + 1 < n_elems) {
			p[2 * i + 2] = (uint8_t)b;
			p[2 * i + 3] = (uint8_t)(b >> 8);
		}
	}
}

void tf_fill_f32_normal(uint8_t *p, size_t n_elems, double sigma)
{
	for (size_t i = 0; i < n_elems; i++) {
		double u1 = ((tf_rnd() >> 11) + 1) * (1.0 / 9007199254740992.0);
		double u2 = (tf_rnd() >> 11) * (1.0 / 9007199254740992.0);
		float f = (float)(sqrt(-2.0 * log(u1)) * sigma *
				  cos(2 * M_PI * u2));

		memcpy(p + 4 * i, &f, 4);
	}
}

double tf_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tf_main(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed != 0;
}
