/*
 * errors.c - error codes, messages and the version.
 *
 * Every failing call leaves a message in its handle and in a thread-local
 * buffer; the latter explains failures of *_open() calls, which have no
 * handle to keep it in.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char tls_errmsg[ENG_ERRMSG_MAX];

int eng_verr(char *buf, int code, const char *fmt, va_list ap)
{
	vsnprintf(tls_errmsg, sizeof(tls_errmsg), fmt, ap);
	if (buf != NULL && buf != tls_errmsg)
		memcpy(buf, tls_errmsg, strlen(tls_errmsg) + 1);
	return code;
}

int eng_err(char *buf, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	eng_verr(buf, code, fmt, ap);
	va_end(ap);
	return code;
}

const char *eng_tls_errmsg(void)
{
	return tls_errmsg;
}

CKPT_API const char *ckpt_strerror(int err)
{
	static _Thread_local char unknown[64];

	switch (err) {
	case 0:
		return "success";
	case CKPT_E_CORRUPT:
		return "checkpoint data or metadata is corrupt";
	case CKPT_E_VERSION:
		return "unsupported checkpoint format version";
	case CKPT_E_NOTFOUND:
		return "no such checkpoint, step or tensor";
	case CKPT_E_BUSY:
		return "a save is already in flight";
	case CKPT_E_DUPNAME:
		return "duplicate tensor name";
	case CKPT_E_INCOMPLETE:
		return "some host's part of the step is missing";
	case CKPT_E_CODEC:
		return "compression library failure";
	case CKPT_E_EXISTS:
		return "step is already committed";
	case CKPT_E_MISMATCH:
		return "slices of one array disagree";
	case CKPT_E_CANCELED:
		return "canceled";
	case CKPT_E_PREVIOUS:
		return "an earlier background save failed";
	default:
		break;
	}
	if (err < 0 && err > -4096)
		return strerror(-err);
	snprintf(unknown, sizeof(unknown), "unknown error %d", err);
	return unknown;
}

CKPT_API unsigned ckpt_version_number(void)
{
	return CKPT_VERSION_NUMBER;
}

#define CKPT_STR2(x) #x
#define CKPT_STR(x) CKPT_STR2(x)

CKPT_API const char *ckpt_version_string(void)
{
	return CKPT_STR(CKPT_VERSION_MAJOR) "." CKPT_STR(
		CKPT_VERSION_MINOR) "." CKPT_STR(CKPT_VERSION_PATCH);
}
