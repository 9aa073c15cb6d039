/*
 * fmt_slices.c - the rule that ties the indexes of one step together
 * (SPEC.md section 7, "Multi-host"): the slices that hosts store of one global tensor
 * agree on dtype and global shape, lie inside that shape, and no two of
 * them share an element. One index cannot check this; the commit (over
 * every host's index) and the reader (over the indexes it opened) both
 * call fmt_slices_check.
 *
 * Cost. The slices are sorted by (name, host), O(n log n). Within one name
 * the overlap test is a sweep along the first dimension in which the
 * slices' offsets differ (the dimension the tensor is sharded along):
 * sorted by their offset there, a slice can only overlap the following
 * slices that start before it ends in that dimension. Row-, column- and
 * block-sharded tensors thus cost O(k log k) for k slices; only slices
 * that are long in the sweep dimension and cut in another are compared
 * pairwise.
 *
 *     all slices --sort (name, host)--> groups of one name
 *         group: agree(dtype, ndim, shape) --> inside shape
 *                --> choose sweep dim --> sort by offset --> sweep
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "fmt_internal.h"

static int cmp_name_host(const void *a, const void *b)
{
	const fmt_slice *x = a, *y = b;
	int c = fmt_tensor_name_cmp(x->t, y->t);

	if (c)
		return c;
	return x->host < y->host ? -1 : x->host > y->host;
}

static int cmp_offset(const void *a, const void *b, void *arg)
{
	uint32_t d = *(const uint32_t *)arg;
	const fmt_slice *x = a, *y = b;

	if (x->t->offset[d] != y->t->offset[d])
		return x->t->offset[d] < y->t->offset[d] ? -1 : 1;
	return x->host < y->host ? -1 : x->host > y->host;
}

/* "bf16[4096,1024]" */
static void describe(const fmt_tensor_entry *t, char *out, size_t cap)
{
	const char *dt = ckpt_dtype_name(t->dtype);
	size_t k;

	k = (size_t)snprintf(out, cap, "%s[", dt ? dt : "?");
	for (uint32_t d = 0; d < t->ndim && k < cap; d++)
		k += (size_t)snprintf(out + k, cap - k, d ? ",%llu" : "%llu",
				      (unsigned long long)t->shape[d]);
	if (k < cap)
		snprintf(out + k, cap - k, "]");
}

static int agree(const fmt_slice *a, const fmt_slice *b, char *err,
		 size_t errlen)
{
	char da[200], db[200];

	if (a->t->dtype == b->t->dtype && a->t->ndim == b->t->ndim &&
	    memcmp(a->t->shape, b->t->shape,
		   a->t->ndim * sizeof(a->t->shape[0])) == 0)
		return 0;
	describe(a->t, da, sizeof(da));
	describe(b->t, db, sizeof(db));
	return fmt_fail(err, errlen, CKPT_E_MISMATCH,
			"tensor \"%.200s\": host %u stores it as %s, host %u "
			"as %s",
			a->t->name, a->host, da, b->host, db);
}

static int inside(const fmt_slice *s, char *err, size_t errlen)
{
	const fmt_tensor_entry *t = s->t;

	for (uint32_t d = 0; d < t->ndim; d++)
		if (t->offset[d] > t->shape[d] ||
		    t->extent[d] > t->shape[d] - t->offset[d])
			return fmt_fail(err, errlen, CKPT_E_CORRUPT,
					"tensor \"%.200s\": host %u: dimension "
					"%u: slice [%llu, +%llu) outside shape "
					"%llu",
					t->name, s->host, d,
					(unsigned long long)t->offset[d],
					(unsigned long long)t->extent[d],
					(unsigned long long)t->shape[d]);
	return 0;
}

static int holds_nothing(const fmt_tensor_entry *t)
{
	for (uint32_t d = 0; d < t->ndim; d++)
		if (t->extent[d] == 0)
			return 1;
	return 0;
}

/* Both hold at least one element and their boxes meet in every dimension
 * (a scalar, ndim 0, is one element). */
static int overlap(const fmt_tensor_entry *a, const fmt_tensor_entry *b)
{
	if (holds_nothing(a) || holds_nothing(b))
		return 0;
	for (uint32_t d = 0; d < a->ndim; d++)
		if (a->offset[d] >= b->offset[d] + b->extent[d] ||
		    b->offset[d] >= a->offset[d] + a->extent[d])
			return 0;
	return 1;
}

/* v[0..n): slices of one name that agree and lie inside their shape. */
static int sweep(fmt_slice *v, size_t n, char *err, size_t errlen)
{
	uint32_t ndim = v[0].t->ndim, d0;

	/* The sweep dimension: the first in which offsets differ. */
	for (d0 = 0; d0 < ndim; d0++) {
		size_t i;

		for (i = 1; i < n; i++)
			if (v[i].t->offset[d0] != v[0].t->offset[d0])
				break;
		if (i < n)
			break;
	}
	if (d0 == ndim)
		d0 = 0; /* all start at the same place (or a scalar) */
	if (ndim > 0)
		qsort_r(v, n, sizeof(*v), cmp_offset, &d0);
	for (size_t i = 0; i < n; i++) {
		const fmt_tensor_entry *a = v[i].t;

		if (holds_nothing(a))
			continue;
		for (size_t j = i + 1; j < n; j++) {
			const fmt_tensor_entry *b = v[j].t;

			if (ndim > 0 &&
			    b->offset[d0] >= a->offset[d0] + a->extent[d0])
				break;
			if (overlap(a, b))
				return fmt_fail(err, errlen, CKPT_E_MISMATCH,
						"tensor \"%.200s\": the slices "
						"stored by host %u and host %u "
						"overlap",
						a->name, v[i].host, v[j].host);
		}
	}
	return 0;
}

int fmt_slices_check(fmt_slice *v, size_t n, uint64_t *distinct, char *err,
		     size_t errlen)
{
	uint64_t names = 0;
	int rc = 0;

	if (distinct)
		*distinct = 0;
	if (n && !v)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!v[i].t || !v[i].t->name || v[i].t->ndim > CKPT_MAX_NDIM)
			return -EINVAL;
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_name_host);
	for (size_t i = 0, j; i < n && rc == 0; i = j) {
		names++;
		rc = inside(&v[i], err, errlen);
		for (j = i + 1; j < n && rc == 0 &&
				fmt_tensor_name_cmp(v[i].t, v[j].t) == 0;
		     j++) {
			rc = agree(&v[i], &v[j], err, errlen);
			if (!rc)
				rc = inside(&v[j], err, errlen);
		}
		if (rc == 0 && j - i > 1)
			rc = sweep(&v[i], j - i, err, errlen);
	}
	if (rc == 0 && distinct)
		*distinct = names;
	return rc;
}
