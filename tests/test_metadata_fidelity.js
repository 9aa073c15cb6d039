// test_metadata_fidelity.js - Google's Node metadata client (gcp-metadata)
// against tests/servers/fake_metadata.py. Run by test_metadata_fidelity.py,
// which starts the server with instance/preempted absent, installs the
// pinned npm package, sets NODE_PATH and points the client at the server
// through GCE_METADATA_HOST (or, with "reads-only", GCE_METADATA_IP):
//
//   node test_metadata_fidelity.js http://127.0.0.1:PORT [reads-only]
//
// The client finds the server itself (we never pass it a URL); the control
// URL is used only to change values and inject faults.
'use strict';

const assert = require('assert');
const gcp = require('gcp-metadata');

const [control, mode] = process.argv.slice(2);

async function fake(what, body, method = 'POST') {
	const r = await fetch(control + '/_fake/' + what, {
		method,
		body: body === undefined ? undefined : JSON.stringify(body),
	});
	assert.strictEqual(r.status, 200, what);
	return r.json();
}

async function status(promise) {
	try {
		await promise;
	} catch (e) {
		return e.response ? e.response.status : e;
	}
	return 200;
}

async function reads() {
	// off a VM the client gives each request 3 s; on one, no limit.
	// Claim residency so that a loaded machine cannot fail the test.
	gcp.setGCPResidency(true);
	// isAvailable() pings `instance` (a 301 to `instance/` here, as on a VM)
	assert.strictEqual(await gcp.isAvailable(), true);
	assert.strictEqual(await gcp.instance('maintenance-event'), 'NONE');
	assert.strictEqual(await gcp.project('project-id'), 'ckpt-test');
	// numbers come back as numbers (json-bigint), as from a VM
	assert.strictEqual(String(await gcp.project('numeric-project-id')),
			   '123456789012');
	assert.strictEqual(await gcp.instance({property:
		'attributes/accelerator-type'}), 'v4-8');
	assert.strictEqual(await gcp.instance('attributes/agent-worker-number'),
			   0); // "0" parses as JSON, as the client does on a VM
	const tok = await gcp.instance('service-accounts/default/token');
	assert.strictEqual(tok.token_type, 'Bearer');
	assert.ok(tok.access_token.startsWith('ya29.'));
	assert.ok(tok.expires_in > 0 && tok.expires_in <= 3599);
	const um = await gcp.instance('upcoming-maintenance');
	assert.strictEqual(typeof um, 'object');
	const tree = await gcp.instance({property: '',
		params: {recursive: 'true'}});
	assert.strictEqual(tree.maintenanceEvent, 'NONE');
	// a key this VM does not have: the 404 the client reports on a VM
	assert.strictEqual(await status(gcp.instance('preempted')), 404);
	const bulk = await gcp.bulk([
		{metadataKey: 'instance/zone'},
		{metadataKey: 'project/project-id'},
	]);
	assert.strictEqual(bulk['instance/zone'],
			   'projects/123456789012/zones/us-central2-b');
	console.log('gcp-metadata reads through ' +
		    (process.env.GCE_METADATA_HOST ? 'GCE_METADATA_HOST' :
		     'GCE_METADATA_IP') + ': ok');
}

async function watches() {
	// the client has no watch API of its own and never shows the ETag, but
	// passes params through: wait_for_change without last_etag works.
	const pending = gcp.instance({property: 'maintenance-event',
		params: {wait_for_change: 'true', timeout_sec: '60'}});
	await fake('wait?long_polls=1&key=instance/maintenance-event&timeout=60',
		   undefined, 'GET');
	await fake('set', {key: 'instance/maintenance-event',
		value: 'TERMINATE_ON_HOST_MAINTENANCE'});
	assert.strictEqual(await pending, 'TERMINATE_ON_HOST_MAINTENANCE');
	// the timeout form returns the current value
	assert.strictEqual(await gcp.instance({property: 'maintenance-event',
		params: {wait_for_change: 'true', timeout_sec: '1'}}),
		'TERMINATE_ON_HOST_MAINTENANCE');

	// a short 503 burst is retried by the client (gaxios) and succeeds
	await fake('fault', {kind: 'status', code: 503, count: 2,
		key: 'instance/zone'});
	assert.strictEqual(await gcp.instance('zone'),
			   'projects/123456789012/zones/us-central2-b');
	let st = await fake('stats', undefined, 'GET');
	assert.strictEqual(st.faults.status, 2);
	// a reply without Metadata-Flavor is rejected, as the client must
	await fake('fault', {kind: 'no_flavor', key: 'instance/name'});
	const err = await status(gcp.instance('name'));
	assert.ok(err instanceof RangeError &&
		  /Metadata-Flavor/.test(err.message), String(err));
	// upcoming-maintenance: a window is a parsed object; 503 is an error
	const window = {type: 'SCHEDULED', maintenance_status: 'PENDING',
		window_start_time: '2026-12-10T04:00:00Z',
		window_end_time: '2026-12-10T08:00:00Z',
		can_reschedule: 'true'};
	await fake('set', {key: 'instance/upcoming-maintenance',
		value: window});
	// (json-bigint builds objects without a prototype)
	assert.deepStrictEqual({...await gcp.instance('upcoming-maintenance')},
			       window);
	await fake('set', {key: 'instance/upcoming-maintenance', status: 503});
	assert.strictEqual(await status(gcp.instance('upcoming-maintenance')),
			   503);
	st = await fake('stats', undefined, 'GET');
	assert.ok(st.by_key['instance/upcoming-maintenance'] >= 3);
	console.log('gcp-metadata watch, retries, flavor check: ok');
}

(async () => {
	await reads();
	if (mode !== 'reads-only')
		await watches();
})().catch(e => {
	console.error(e);
	process.exit(1);
});
