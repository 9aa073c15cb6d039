/*
 * test_gcs_ckpt.h - helpers for the tests of saves to Cloud Storage
 * (test_gcs_save.c, test_gcs_resume.c, test_gcs_pod.c): a client on the
 * fake server, and the checks that what the bucket holds is what the
 * local directory holds and that a committed step is complete.
 */
#ifndef CKPT_TEST_GCS_CKPT_H
#define CKPT_TEST_GCS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>

#include "test_gcs_util.h"

struct gcs_client;

/* The fake server every test of the program uses (gk_main starts it). */
extern tu_server gk_srv;
/* Starts gk_srv with `bucket`, points STORAGE_EMULATOR_HOST at it (the
 * engine finds it there), runs one test case `name` of `tests` with a
 * timeout, stops the server; returns the exit code. */
int gk_main(const char *bucket, const char *name, int timeout_s,
	    const TTest *const *tests, size_t n);

/* A client on `url` with compressed backoff (aborts on failure). */
struct gcs_client *gk_client(const char *url);
/* PREFIX/step-N/name (PREFIX without a trailing slash; malloc'd). */
char *gk_object(const char *prefix, uint64_t step, const char *name);
/* Objects whose names start with `prefix` (-1 on error). */
long gk_count(struct gcs_client *gc, const char *bucket, const char *prefix);
/* 1 if the object exists, 0 if not, -1 on error. */
int gk_exists(struct gcs_client *gc, const char *bucket, const char *name);
/* Every hH-*.shard and hH.index of host h under DIR/step-N is in the
 * bucket under PREFIX/step-N/ byte for byte. 0, or -1 with `why`. */
int gk_same_as_local(struct gcs_client *gc, const char *bucket,
		     const char *prefix, const char *dir, uint64_t step,
		     uint32_t host, char *why, size_t whylen);
/* The step is complete in the bucket: every host's index decodes and
 * each file it lists is there with the size and XXH3 the index records.
 * 0, or -1 with `why`. */
int gk_step_complete(struct gcs_client *gc, const char *bucket,
		     const char *prefix, uint64_t step, uint32_t hosts,
		     char *why, size_t whylen);

/* Downloads every object under PREFIX/ into dir (same relative names),
 * so the local reader can open a bucket's checkpoint. 0 or -1. */
int gk_download(struct gcs_client *gc, const char *bucket, const char *prefix,
		const char *dir);

#endif
