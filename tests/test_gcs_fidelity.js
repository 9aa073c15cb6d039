// test_gcs_fidelity.js - the official Node client (@google-cloud/storage)
// against tests/servers/fake_gcs.py. Run by test_gcs_fidelity.py (which
// starts the server, installs the pinned npm package and sets NODE_PATH):
//
//   node test_gcs_fidelity.js http://127.0.0.1:PORT BUCKET [soak]
//
// With `soak` the server runs its random fault mode: create-only uploads and
// validated downloads must still all come out byte-identical.
//
// Every check compares the client's view with values computed here (the
// client's own CRC32C class, local buffers), so a server that lies fails.
'use strict';

const assert = require('assert');
const crypto = require('crypto');
const {Storage, CRC32C} = require('@google-cloud/storage');

const [endpoint, bucketName, mode] = process.argv.slice(2);
const CHUNK = 256 * 1024;

async function stats() {
	const r = await fetch(endpoint + '/_fake/stats');
	return r.json();
}

async function retryTest(instructions) {
	const r = await fetch(endpoint + '/retry_test', {
		method: 'POST',
		headers: {'Content-Type': 'application/json'},
		body: JSON.stringify({instructions}),
	});
	assert.strictEqual(r.status, 200);
	return (await r.json()).id;
}

async function retryTestDone(id) {
	const r = await fetch(endpoint + '/retry_test/' + id);
	return (await r.json()).completed;
}

function crc(buf) {
	const c = new CRC32C();
	c.update(buf);
	return c.toString();
}

async function expectCode(promise, code, what) {
	try {
		await promise;
	} catch (e) {
		// JSON API calls carry the status in .code; the resumable
		// upload path (gaxios) in .status / .response.status
		const got = e.code || e.status ||
			(e.response && e.response.status);
		assert.strictEqual(got, code, `${what}: ${e.message}`);
		return e;
	}
	assert.fail(`${what}: succeeded, expected HTTP ${code}`);
}

async function main() {
	const storage = new Storage({
		apiEndpoint: endpoint,
		projectId: 'test-project',
		retryOptions: {autoRetry: true, maxRetries: 3,
			       retryDelayMultiplier: 1, maxRetryDelay: 1,
			       totalTimeout: 60},
	});
	const bucket = storage.bucket(bucketName);
	const [exists] = await bucket.exists();
	assert.ok(exists, 'bucket exists');

	// resumable upload in 256 KiB chunks, CRC32C validated by the client
	const big = crypto.randomBytes(6 * CHUNK + 12345);
	const before = await stats();
	const f = bucket.file('node/resumable.bin');
	await f.save(big, {resumable: true, chunkSize: CHUNK,
			   validation: 'crc32c',
			   metadata: {contentType: 'application/x-test'}});
	const after = await stats();
	const puts = after.methods['storage.objects.insert'] -
		(before.methods['storage.objects.insert'] || 0);
	assert.ok(puts >= 8, `resumable upload used ${puts} requests, ` +
		  'expected a POST and 7 chunk PUTs');
	const [md] = await f.getMetadata();
	assert.strictEqual(md.size, String(big.length));
	assert.strictEqual(md.crc32c, crc(big), 'crc32c of the object');
	assert.strictEqual(md.md5Hash, crypto.createHash('md5').update(big)
			   .digest('base64'));
	assert.strictEqual(md.contentType, 'application/x-test');

	// download with validation, whole and ranged
	const [down] = await f.download({validation: 'crc32c'});
	assert.ok(down.equals(big), 'download is byte-identical');
	const [part] = await f.download({start: 1000, end: 300000});
	assert.ok(part.equals(big.subarray(1000, 300001)), 'ranged download');

	// a download interrupted by the server is retried by the client
	const rt = await retryTest({'storage.objects.get':
				    ['return-503']});
	storage.interceptors.push({request: (o) => {
		o.headers = Object.assign({}, o.headers,
					  {'x-retry-test-id': rt});
		return o;
	}});
	const [again] = await f.download({validation: 'crc32c'});
	storage.interceptors.pop();
	assert.ok(again.equals(big), 'download after a 503');
	assert.ok(await retryTestDone(rt), 'retry_test instruction consumed');

	// multipart uploads, list with prefix, delimiter and pages
	const names = [];
	for (let i = 0; i < 5; i++) {
		const n = `node/list/${String(i).padStart(2, '0')}`;
		await bucket.file(n).save(Buffer.from('part ' + i),
					  {resumable: false});
		names.push(n);
	}
	await bucket.file('node/list/sub/x').save('x', {resumable: false});
	const seen = [];
	let query = {prefix: 'node/list/', delimiter: '/', maxResults: 2,
		     autoPaginate: false};
	let prefixes = [];
	let pages = 0;
	while (query) {
		const [files, next, resp] = await bucket.getFiles(query);
		seen.push(...files.map((x) => x.name));
		prefixes = prefixes.concat(resp.prefixes || []);
		query = next;
		pages++;
	}
	assert.deepStrictEqual(seen, names, 'listed names, in order');
	assert.deepStrictEqual(prefixes, ['node/list/sub/'], 'prefixes');
	assert.ok(pages >= 3, `listing took ${pages} pages of 2`);

	// compose: bytes and CRC32C of the concatenation
	const parts = names.slice(0, 3).map((n) => bucket.file(n));
	const dest = bucket.file('node/composed');
	await bucket.combine(parts, dest);
	const want = Buffer.concat([0, 1, 2].map((i) =>
		Buffer.from('part ' + i)));
	const [cmd] = await dest.getMetadata();
	assert.strictEqual(cmd.componentCount, 3);
	assert.strictEqual(cmd.crc32c, crc(want), 'composite crc32c');
	const [cbytes] = await dest.download({validation: 'crc32c'});
	assert.ok(cbytes.equals(want), 'composite bytes');

	// create-only precondition: 412 when the object exists
	await expectCode(f.save(Buffer.from('nope'), {resumable: false,
		preconditionOpts: {ifGenerationMatch: 0}}), 412,
	'ifGenerationMatch=0 on an existing object');
	await expectCode(f.save(Buffer.from('nope'), {resumable: true,
		chunkSize: CHUNK, preconditionOpts: {ifGenerationMatch: 0}}),
	412, 'resumable ifGenerationMatch=0 on an existing object');
	const fresh = bucket.file('node/create-only');
	await fresh.save(Buffer.from('first'), {resumable: false,
		preconditionOpts: {ifGenerationMatch: 0}});
	const [still] = await f.download();
	assert.ok(still.equals(big), 'failed precondition changed nothing');

	// a corrupt upload is rejected by the server (400)
	await expectCode(bucket.file('node/corrupt').save(Buffer.from('abc'),
		{resumable: false, validation: false,
		 metadata: {crc32c: crc(Buffer.from('abd'))}}), 400,
	'upload with a wrong crc32c');

	// 404s, delete
	await expectCode(bucket.file('node/missing').download(), 404,
		'download of a missing object');
	await dest.delete();
	const [gone] = await dest.exists();
	assert.ok(!gone, 'deleted object is gone');
	await expectCode(dest.delete(), 404, 'second delete');
	console.log('node client: all checks passed');
	// keep-alive sockets of the clients must not hold the process
	process.exit(0);
}

async function soak() {
	const storage = new Storage({
		apiEndpoint: endpoint,
		projectId: 'test-project',
		retryOptions: {autoRetry: true, maxRetries: 10,
			       retryDelayMultiplier: 1.2, maxRetryDelay: 2,
			       totalTimeout: 300},
	});
	const bucket = storage.bucket(bucketName);
	for (let i = 0; i < 8; i++) {
		// multipart, made retryable by the create-only precondition;
		// chunked resumable uploads are left out: the client gives up
		// on some retry sequences whatever the server (its issue 2193)
		const data = crypto.randomBytes(4 * CHUNK + 1000 * i);
		const f = bucket.file('soak/' + i);
		await f.save(data, {resumable: false, validation: 'crc32c',
				    preconditionOpts: {ifGenerationMatch: 0}});
		const [d] = await f.download({validation: 'crc32c'});
		assert.ok(d.equals(data), `soak object ${i} byte-identical`);
	}
	const st = await stats();
	assert.strictEqual(st.objects, 8, 'no stray or missing objects');
	assert.ok(st.faults_total > 0, 'faults were injected');
	console.log(`node client soak: 8 objects through ${st.faults_total} ` +
		    `faults in ${st.requests} requests: ` +
		    JSON.stringify(st.faults));
	process.exit(0);
}

(mode === 'soak' ? soak() : main()).catch((e) => {
	console.error('FAIL:', e && e.stack ? e.stack : e);
	process.exit(1);
});
