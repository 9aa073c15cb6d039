/*
 * test_gcs_util.h - helpers for the gcs client tests: start/stop the
 * loopback fake Cloud Storage server (tests/servers/fake_gcs.py), the
 * retry-test interface (POST /retry_test, GET /retry_test/ID), a plain
 * HTTP call, and a tiny hostile HTTP server in a thread whose replies the
 * test writes by hand (wrong crc32c, truncated body, garbage JSON, ...).
 */
#ifndef CKPT_TEST_GCS_UTIL_H
#define CKPT_TEST_GCS_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "testutil.h"

/* Starts fake_gcs.py with bucket `bucket` ($CKPT_FAKE_GCS, default
 * $CKPT_TEST_SRCDIR/servers/fake_gcs.py) through tu_server_start (which
 * skips when /usr/bin/python3 or the server file is missing); stop it
 * with tu_server_stop. */
void gt_server_start(tu_server *s, const char *bucket);
/* The same with more arguments (NULL-terminated), e.g. --fault-rate. */
void gt_server_start_args(tu_server *s, const char *bucket,
			  const char *const *extra);

/* n deterministic pseudo-random bytes from seed (malloc'd; aborts on
 * ENOMEM). */
unsigned char *gt_pattern(size_t n, uint64_t seed);

/* One HTTP request; returns the status (or -1), body in *resp (malloc'd,
 * may be NULL). */
long gt_http(const char *method, const char *url, const char *body,
	     char **resp);
/* Creates a retry test {"instructions": {method: [instr...]}} and returns
 * its id (static storage, overwritten by the next call); NULL on error. */
const char *gt_retry_test(const char *base, const char *method,
			  const char *const *instr, size_t n);
/* 1 if every instruction was consumed, 0 if not, -1 on error. */
int gt_retry_test_completed(const char *base, const char *id);

/* The fake's hostile rules (BASE/_fake/hostile, fake_gcs_hostile.py):
 * adds one (the test fails if the server refuses it); how many times the
 * rules fired in all; removes every rule and says how many times they
 * fired. */
void gt_rule(const char *base, const char *mode, const char *match);
long gt_rules_fired(const char *base);
long gt_rules_clear(const char *base);

/* Hostile server: for each request, fn(arg, fd, method, target, headers)
 * writes whatever it likes to fd; the connection is closed afterwards. */
typedef void (*gt_hostile_fn)(void *arg, int fd, const char *method,
			      const char *target, const char *headers);
struct gt_hostile {
	int lfd;
	int port;
	char url[64];
	pthread_t th;
	gt_hostile_fn fn;
	void *arg;
	volatile int stop;
	volatile int requests;
};
void gt_hostile_start(struct gt_hostile *h, gt_hostile_fn fn, void *arg);
void gt_hostile_stop(struct gt_hostile *h);
/* write all of a string / buffer to fd (best effort) */
void gt_send(int fd, const void *p, size_t n);

#endif
