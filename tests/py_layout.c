/*
 * py_layout.c - prints the layout of every public struct the Python
 * binding mirrors (python/ckpt/_lib.py), for tests/test_python.py to
 * compare with ctypes: one line per struct "NAME SIZE ALIGN" followed by
 * one line per field "  FIELD OFFSET SIZE". Public header only.
 */
#include <stddef.h>
#include <stdio.h>

#include "ckpt.h"

#define S(T) printf("%s %zu %zu\n", #T, sizeof(T), _Alignof(T))
#define F(T, f) \
	printf("  %s %zu %zu\n", #f, offsetof(T, f), sizeof(((T *)0)->f))

int main(void)
{
	S(ckpt_settings);
	F(ckpt_settings, staging_bytes);
	F(ckpt_settings, chunk_bytes);
	F(ckpt_settings, codec);
	F(ckpt_settings, level);
	F(ckpt_settings, threads);
	F(ckpt_settings, files_per_host);
	F(ckpt_settings, host_index);
	F(ckpt_settings, host_count);
	F(ckpt_settings, queue_depth);
	F(ckpt_settings, keep_last);
	F(ckpt_settings, keep_every);
	F(ckpt_settings, flags);
	F(ckpt_settings, remote);
	F(ckpt_settings, reserved);
	S(ckpt_tensor);
	F(ckpt_tensor, name);
	F(ckpt_tensor, dtype);
	F(ckpt_tensor, ndim);
	F(ckpt_tensor, shape);
	F(ckpt_tensor, slice_offset);
	F(ckpt_tensor, slice_extent);
	F(ckpt_tensor, data);
	F(ckpt_tensor, nbytes);
	F(ckpt_tensor, flags);
	F(ckpt_tensor, reserved0);
	F(ckpt_tensor, reserved);
	S(ckpt_progress);
	F(ckpt_progress, step);
	F(ckpt_progress, state);
	F(ckpt_progress, status);
	F(ckpt_progress, bytes_total);
	F(ckpt_progress, bytes_staged);
	F(ckpt_progress, bytes_written);
	F(ckpt_progress, bytes_committed);
	F(ckpt_progress, bytes_stored);
	F(ckpt_progress, reason);
	F(ckpt_progress, sinks_failed);
	F(ckpt_progress, reserved);
	S(ckpt_save_opts);
	F(ckpt_save_opts, codec);
	F(ckpt_save_opts, level);
	F(ckpt_save_opts, reason);
	F(ckpt_save_opts, flags);
	F(ckpt_save_opts, deadline_ns);
	F(ckpt_save_opts, reserved);
	S(ckpt_upload_status);
	F(ckpt_upload_status, step);
	F(ckpt_upload_status, state);
	F(ckpt_upload_status, status);
	F(ckpt_upload_status, bytes_total);
	F(ckpt_upload_status, bytes_confirmed);
	F(ckpt_upload_status, pending_steps);
	F(ckpt_upload_status, reserved0);
	F(ckpt_upload_status, retries);
	F(ckpt_upload_status, msg);
	F(ckpt_upload_status, reserved);
	S(ckpt_step_info);
	F(ckpt_step_info, step);
	F(ckpt_step_info, host_count);
	F(ckpt_step_info, file_count);
	F(ckpt_step_info, tensor_count);
	F(ckpt_step_info, raw_bytes);
	F(ckpt_step_info, stored_bytes);
	F(ckpt_step_info, commit_unix_ns);
	F(ckpt_step_info, reason);
	F(ckpt_step_info, reserved32);
	F(ckpt_step_info, referenced_by);
	F(ckpt_step_info, reserved);
	S(ckpt_tensor_info);
	F(ckpt_tensor_info, name);
	F(ckpt_tensor_info, dtype);
	F(ckpt_tensor_info, ndim);
	F(ckpt_tensor_info, shape);
	F(ckpt_tensor_info, nbytes);
	F(ckpt_tensor_info, slice_count);
	F(ckpt_tensor_info, reserved0);
	F(ckpt_tensor_info, stored_bytes);
	F(ckpt_tensor_info, reserved);
	S(ckpt_read_req);
	F(ckpt_read_req, name);
	F(ckpt_read_req, offset);
	F(ckpt_read_req, extent);
	F(ckpt_read_req, dst);
	F(ckpt_read_req, dst_bytes);
	F(ckpt_read_req, status);
	F(ckpt_read_req, flags);
	F(ckpt_read_req, reserved);
	S(ckpt_watch_opts);
	F(ckpt_watch_opts, flags);
	F(ckpt_watch_opts, every_steps);
	F(ckpt_watch_opts, every_seconds);
	F(ckpt_watch_opts, time_scale);
	F(ckpt_watch_opts, timeout_sec);
	F(ckpt_watch_opts, http_slack_ms);
	F(ckpt_watch_opts, upcoming_interval_ms);
	F(ckpt_watch_opts, absent_recheck_ms);
	F(ckpt_watch_opts, backoff_min_ms);
	F(ckpt_watch_opts, backoff_max_ms);
	F(ckpt_watch_opts, maintenance_window_ms);
	F(ckpt_watch_opts, preempted_window_ms);
	F(ckpt_watch_opts, sigterm_window_ms);
	F(ckpt_watch_opts, on_notice);
	F(ckpt_watch_opts, arg);
	F(ckpt_watch_opts, after_save);
	F(ckpt_watch_opts, upcoming_lead_s);
	F(ckpt_watch_opts, pod_interval_ms);
	F(ckpt_watch_opts, pod_slack_ms);
	F(ckpt_watch_opts, reserved);
	S(ckpt_save_advice);
	F(ckpt_save_advice, reason);
	F(ckpt_save_advice, flags);
	F(ckpt_save_advice, deadline_ns);
	F(ckpt_save_advice, notice_ns);
	F(ckpt_save_advice, event);
	F(ckpt_save_advice, reserved);
	S(ckpt_watch_key);
	F(ckpt_watch_key, key);
	F(ckpt_watch_key, value);
	F(ckpt_watch_key, etag);
	F(ckpt_watch_key, error);
	F(ckpt_watch_key, state);
	F(ckpt_watch_key, flags);
	F(ckpt_watch_key, changed_ns);
	F(ckpt_watch_key, ok_ns);
	F(ckpt_watch_key, requests);
	F(ckpt_watch_key, errors);
	F(ckpt_watch_key, changes);
	F(ckpt_watch_key, reserved);
	S(ckpt_watch_info);
	F(ckpt_watch_info, running);
	F(ckpt_watch_info, healthy);
	F(ckpt_watch_info, nkeys);
	F(ckpt_watch_info, sigterm);
	F(ckpt_watch_info, notices);
	F(ckpt_watch_info, degraded);
	F(ckpt_watch_info, host);
	F(ckpt_watch_info, pod_state);
	F(ckpt_watch_info, pod_requests_lost);
	F(ckpt_watch_info, pod_request);
	F(ckpt_watch_info, pod_target);
	F(ckpt_watch_info, pod_requests_made);
	F(ckpt_watch_info, reserved);
	F(ckpt_watch_info, keys);
	S(ckpt_plan);
	F(ckpt_plan, event);
	F(ckpt_plan, reason);
	F(ckpt_plan, codec);
	F(ckpt_plan, dest);
	F(ckpt_plan, inflight);
	F(ckpt_plan, deadline_ns);
	F(ckpt_plan, planned_ns);
	F(ckpt_plan, state_bytes);
	F(ckpt_plan, predicted_s);
	F(ckpt_plan, left_s);
	F(ckpt_plan, step);
	F(ckpt_plan, status);
	F(ckpt_plan, deadline_met);
	F(ckpt_plan, durable_ns);
	F(ckpt_plan, margin_s);
	F(ckpt_plan, local_bps);
	F(ckpt_plan, remote_bps);
	F(ckpt_plan, encode_bps);
	F(ckpt_plan, ratio);
	F(ckpt_plan, reserved);
	return 0;
}
