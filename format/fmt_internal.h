/*
 * fmt_internal.h - helpers shared by the files of format/ and by nothing
 * else: engine/ includes fmt.h only.
 */
#ifndef CKPT_FMT_INTERNAL_H
#define CKPT_FMT_INTERNAL_H

#include <stddef.h>

#include "fmt.h"

/*
 * The one error helper of format/: writes the message to err[0..errlen)
 * when err is not NULL and returns `code`, so that a check reads
 * `return fmt_fail(err, errlen, CKPT_E_CORRUPT, "...", ...);`.
 */
int fmt_fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Orders tensor entries by name (bytewise, shorter first on a tie):
 * negative, 0 or positive like strcmp. */
int fmt_tensor_name_cmp(const fmt_tensor_entry *a, const fmt_tensor_entry *b);

/* enum ckpt_save_reason of a name ckpt_reason_name returns, or -1. */
int fmt_reason_from_name(const char *name);

#endif /* CKPT_FMT_INTERNAL_H */
